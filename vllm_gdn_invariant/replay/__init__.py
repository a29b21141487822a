"""Response replay for the trainer: a whole response's GDN layer with the rollout's bits.

``replay_response`` (response.py) gives every response token's GDN output and each sequence's
final states as mode golden's decode steps produced them, in one call, differentiable.
``prompt_state`` (prompt.py) gives a prompt's outputs and final states with the bits of vLLM's
batch-invariant prefill: the states ``replay_response`` starts from. docs/replay.md describes
both.
"""

from .prompt import prompt_state
from .response import replay_response

__all__ = ["prompt_state", "replay_response"]
