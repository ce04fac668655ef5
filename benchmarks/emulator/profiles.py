"""Latency profiles: how long an emulated worker's engine step takes, and how big its cache is.

A step lasts `step_ms + decode_ms_per_stream * answers decoding + prefill_ms_per_token * prompt
tokens read in it`, the model `benchmarks/fleet_sim.py` fits to a real worker. Each profile
says where its figures come from.
"""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Profile:
    name: str
    step_ms: float
    decode_ms_per_stream: float
    prefill_ms_per_token: float
    max_batched_tokens: int  # vLLM's max_num_batched_tokens: the step's token budget
    max_num_seqs: int
    block_size: int
    num_blocks: int
    source: str

    def sized(self, *, num_blocks: int = 0, max_num_seqs: int = 0) -> Profile:
        """The same worker with another KV cache size or batch limit (0: the profile's)."""
        return replace(
            self,
            num_blocks=num_blocks or self.num_blocks,
            max_num_seqs=max_num_seqs or self.max_num_seqs,
        )

    def answers_per_s(self, output_tokens: int, uncached_tokens: float) -> float:
        """What one worker serves at most: answers of `output_tokens` tokens per second, each
        after reading `uncached_tokens` of its prompt, with every step decoding a full batch
        of `max_num_seqs` answers (the step's fixed part shared by them, each answer's own
        part and its prompt's reading not)."""
        per_answer_ms = (
            output_tokens * (self.step_ms / self.max_num_seqs + self.decode_ms_per_stream)
            + self.prefill_ms_per_token * uncached_tokens
        )
        return 1000 / per_answer_ms


PROFILES = {
    profile.name: profile
    for profile in (
        Profile(
            name="cpu-smollm2",
            # `fleet_sim.py --calibrate` against this project's vLLM CPU worker (SmolLM2-135M on
            # one core of the 2-core machine), twice: 49.6 / 40.1 ms a step, 2.5 / 2.9 ms per
            # stream, 1.90 / 1.90 ms per prompt token (a step of one answer: 45 ms, of which
            # 2.7 for its stream). vLLM's CPU defaults: block size 128; the cache as the race
            # runs `run_worker` (96 blocks of 128 tokens). Fit today's worker with
            # `emulator_fidelity.py`: this machine's speed changes from day to day.
            step_ms=42.3,
            decode_ms_per_stream=2.7,
            prefill_ms_per_token=1.9,
            max_batched_tokens=2048,
            max_num_seqs=64,
            block_size=128,
            num_blocks=96,
            source="fleet_sim.py --calibrate on this project's vLLM CPU worker (SmolLM2-135M)",
        ),
        Profile(
            name="h100-8b",
            # An 8B model (Llama-3.1-8B, bf16) on one H100 80GB under vLLM:
            # - TTFT 60-120 ms and ITL 10-15 ms: the figures of llm-d-inference-sim's 8B-on-H100
            #   profile as issue 35 quotes them (not yet checked on a GPU here); a 1,000
            #   token prompt then reads in ~60 ms (0.05 ms a token past the step) and a step of
            #   64 answers lasts ~12 ms (8 ms + 0.06 ms each), 256 answers ~23 ms.
            # - the cache: KV per token = 2 (K and V) x 32 layers x 8 KV heads x 128 dims x
            #   2 bytes = 128 KiB (the model's config.json); 80 GB x 0.9 (vLLM's
            #   gpu_memory_utilization) - 16 GB of weights - ~2 GB of activations leaves
            #   ~54 GB: ~430k tokens, 26,900 blocks of 16 (vLLM's CUDA block size).
            # - vLLM V1's defaults on such a GPU: max_num_seqs 256, max_num_batched_tokens 8192.
            step_ms=8.0,
            decode_ms_per_stream=0.06,
            prefill_ms_per_token=0.05,
            max_batched_tokens=8192,
            max_num_seqs=256,
            block_size=16,
            num_blocks=26_900,
            source="TTFT/ITL of llm-d-inference-sim's 8B-on-H100 profile (as issue 35 quotes "
            "it); KV from Llama-3.1-8B's config; vLLM V1 defaults",
        ),
    )
}


def profile_named(name: str) -> Profile:
    try:
        return PROFILES[name]
    except KeyError:
        raise ValueError(f"no profile {name!r}; known: {', '.join(sorted(PROFILES))}") from None
