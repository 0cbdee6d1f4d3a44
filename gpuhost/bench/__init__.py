"""The guest-side benchmark suite behind `gpuhost smoke-test`: build, run, judge, report."""
