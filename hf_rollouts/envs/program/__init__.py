"""Agent programs as environments: :class:`ProgramEnv` (``program``), its config, how programs are started and
isolated (:mod:`.launch`) and the process they run in (:mod:`.child`, whose :class:`~.child.ProgramEndpoint` a program
is handed)."""

from .child import ProgramEndpoint
from .env import ProgramConfig, ProgramEnv, program_module
from .launch import ISOLATIONS, ProgramLaunch, run_program
from .rows import program_task_rows

__all__ = [
    "ISOLATIONS",
    "ProgramConfig",
    "ProgramEndpoint",
    "ProgramEnv",
    "ProgramLaunch",
    "program_module",
    "program_task_rows",
    "run_program",
]
