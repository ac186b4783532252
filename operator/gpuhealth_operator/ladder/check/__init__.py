"""Active checks: idle nodes prove their GPUs with a Job the scheduler preempts for real work."""
