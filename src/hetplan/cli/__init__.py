"""The ``hetplan`` command: one typer app, one module per subcommand group."""
