"""Built-in attention variants; every module here is imported and registers itself."""
