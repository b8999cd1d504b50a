"""Statistics and explanations: paired-timing statistics, the peak sentence, findings, progress."""
