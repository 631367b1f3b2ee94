"""A verifier env of your own: one function, a few rows, one registration.

See it score (from the repository root)::

    python envs/example_verifier.py

Train on it (``--import`` registers the env in the driver and in every Ray worker)::

    rllib train --algo GRPO --env example/Reverse-v0 --import envs/example_verifier.py
"""

import gymnasium as gym

from rllib_dph.envs import register_verifier_env

WORDS = ["ray", "rllib", "policy", "gradient", "reward", "verifier"]


def reversed_word(completion: str, answer: str) -> bool:
    """The verifier, ``verifier(completion, ground_truth) -> bool | float | Verdict``: True (reward
    1.0) when the completion is the reversed word."""
    return completion.strip() == answer


register_verifier_env(
    "example/Reverse-v0",
    verifier=reversed_word,
    data=[{"question": word, "answer": word[::-1]} for word in WORDS],
    prompt_format="Write the word backwards, nothing else: {question}",
)

if __name__ == "__main__":
    env = gym.make("example/Reverse-v0")
    prompt, _ = env.reset(options={"index": 0})
    for completion in ("yar", "ray"):
        _, reward, _, _, info = env.step(completion)
        print(f"{prompt!r} -> {completion!r}: reward {reward}, correct {info['correct']}")
        env.reset(options={"index": 0})
