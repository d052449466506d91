def find_resumable(path):
    return None
