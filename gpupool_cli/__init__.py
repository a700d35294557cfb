"""The ``gpupool`` command: the composition root that wires core, API and billing together."""
