"""Training scripts the campaign runs, written as a user would write them (DDP; a pipeline with
sub-groups).
"""
