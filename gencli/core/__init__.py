"""Pure computation: no click, no rich, no manifest. Every step has one ``run()``."""
