"""The command line: one module per verb. The only place that prints or exits."""
