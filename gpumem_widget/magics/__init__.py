"""`%gpumem`: the line and cell magic and every subcommand."""
