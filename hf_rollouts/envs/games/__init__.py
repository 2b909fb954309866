"""The games hf_rollouts ships: Twenty Questions (:mod:`.twenty_questions`), Mastermind (:mod:`.mastermind`),
guess-the-number (:mod:`.guess_number`), the hidden-function tool env (:mod:`.hidden_function`) and one-question
arithmetic with its calculator tool variant (:mod:`.arithmetic`). Each is
imported under its public name, ``hf_rollouts.envs.<game>`` (:mod:`hf_rollouts.envs.public_names`)."""
