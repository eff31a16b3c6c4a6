"""`python -m ampgan.diagnose`: is a failing AMP run float16's fault, where, and which fix works.

One module per stage: replay (the AMP run against its FP32 twin in lockstep), statistics,
ranges (loss-scale range per layer), locate (first non-finite value), framework (the GP's
second-order gradient vs finite differences), verdict (and candidate fixes), verify (fixes
replayed and ranked; K-seed check), fp32_set_search (ddmin for a minimal FP32 keep-list), verdict_report;
case opens what is diagnosed; pipeline runs the stages in one order (Case -> Evidence -> Verdict
-> Remedies); analysis is one configuration's evidence; command parses, prints and logs.
"""

import ampgan.diagnose.case  # noqa: F401 - registers schema/diagnose/default, which conf/diagnose/ extends
