"""Flows: load -> decide -> apply. judge (the reconcile pass), provision (`fleet apply`), why."""
