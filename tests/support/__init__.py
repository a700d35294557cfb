"""What only the tests use; what they share with the benches is in bench.support.

- ``tests.support.http``: a stdlib server the tests serve, the API's error shape;
- ``tests.support.sacct_dumps``: sacct output in the billing pass's shape, for tests that replay it;
- ``tests.support.gpu_exporter``, ``receiver``, ``storage``, ``readme``: fakes and readers of their own tiers.
"""
