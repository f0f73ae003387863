"""One module per engine. Importing this package imports no driver: ``open_store`` imports
the backend module (and with it its driver) only when a URL asks for it."""
