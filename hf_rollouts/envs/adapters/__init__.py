"""Adapters of other ecosystems' environments: TextArena (:mod:`.textarena`), reasoning-gym
(:mod:`.reasoning_gym`), SkyRL-gym (:mod:`.skyrl`), OpenEnv (:mod:`.openenv`) and verifiers (:mod:`.verifiers`).
Each keeps only its translation; the pattern they share is :class:`~.adapter.AdapterEnv`. Each is imported under
its public name, ``hf_rollouts.envs.<adapter>`` (:mod:`hf_rollouts.envs.public_names`); importing one does not
import its ecosystem's package, building an env does."""
