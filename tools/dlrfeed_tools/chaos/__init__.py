"""The chaos matrix: scenarios (with what each proves), their run, and the report."""
