"""The sandbox image: its recipe (pure) and its offline build."""
