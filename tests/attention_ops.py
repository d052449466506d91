"""The SDPA operators each attention choice runs, as the profiler names them."""

from __future__ import annotations

FLASH_CPU = "aten::_scaled_dot_product_flash_attention_for_cpu"


MATH = "aten::_scaled_dot_product_attention_math"
