"""What each job's GPUs are doing: exporter scrapes (``exporter``) and the idle check (``idle``)."""
