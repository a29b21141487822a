"""Response replay for the trainer: a whole response's GDN layer with the rollout's bits.

``replay_response`` (response.py) gives every response token's GDN output and each sequence's
final states as mode golden's decode steps produced them, in one call, differentiable;
docs/replay.md describes it.
"""

from .response import replay_response

__all__ = ["replay_response"]
