"""float16's range, named once: every module that compares a value with it imports these."""

FP16_MAX = 65504.0                       # the largest finite float16 (just under 2**16)
FP16_MIN_NORMAL_EXP = -14                # float16's smallest normal is 2**-14 (~6.1e-5) ...
FP16_MIN_NORMAL = 2.0**FP16_MIN_NORMAL_EXP
FP16_MIN_SUBNORMAL_EXP = -24             # ... and its subnormals reach down to 2**-24
