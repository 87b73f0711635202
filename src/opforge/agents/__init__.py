"""The four roles that divide the seven stages: which skills each holds and what each may not do."""
