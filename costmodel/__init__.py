"""What a plan costs (memory, time, communication) and which plan to run."""
