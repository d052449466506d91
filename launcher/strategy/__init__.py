"""The engines behind one interface (`base.Strategy`): one package per engine (`ddp`,
`deepspeed`, `fsdp2`), each declaring what the rest of the launcher may know of it in the
registry (launcher.config.registry); an engine's own module, and so its package
(deepspeed), is imported only when a run chooses it. Shared by engines: the optimizer
(`optim`) and the timer of collectives an engine issues itself (`collective_timer`)."""
