"""Built-in temperature rules; every module here is imported and registers itself."""
