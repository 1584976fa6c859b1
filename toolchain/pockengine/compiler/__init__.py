"""The compile path: CompileSpec -> export -> lowering passes -> plan -> Program (program.py),
and the summary pock-build writes (report.py)."""
