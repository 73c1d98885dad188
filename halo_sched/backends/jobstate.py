"""The job states under their earlier name: they live in halo_sched/jobstate.py (below the
history and the backends, which both speak them); this module hands the same objects on."""
from ..jobstate import (  # noqa: F401
    UNREADABLE, JobState, JobStatus, NomadDetail, SlurmDetail, _describe_spares, in_place_fields, state_named,
)
