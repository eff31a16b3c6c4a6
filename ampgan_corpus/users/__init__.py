"""Nets as a user writes them, in files of their own: diagnose's cases that it was not tuned on
name these files' lines (the op that overflows), so each net lives in a file a user could own."""
