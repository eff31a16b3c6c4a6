"""diagnose's planted-failure corpus: small nets written the way a user writes them, each selected by
`_target_` (conf/experiment/diag_*.yaml, study_underflow.yaml), so the corpus shows that a user's
own net gets every diagnosis. Nothing in `ampgan` imports this package."""
