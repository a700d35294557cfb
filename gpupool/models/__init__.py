"""Typed ORM models, split by area."""

from gpupool.db import Base
from gpupool.models.accounts import Account
from gpupool.models.jobs import TERMINAL_STATES, Job, SlurmSync

__all__ = ["TERMINAL_STATES", "Account", "Base", "Job", "SlurmSync"]
