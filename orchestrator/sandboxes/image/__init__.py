"""The sandbox image: its recipe (pure), its inputs in this checkout, whether an image fits
this orchestrator, and its offline build."""
