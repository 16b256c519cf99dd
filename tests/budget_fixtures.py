"""The step shape the plug-in's scheduler-level cases share with the simulator's twin of them."""

from scheduler.latency_model import LatencyModel

STEP_TOKENS = 512
BLOCK = 16
BATCH_PROMPT = 16_000
CHAT_PROMPT = 300
TARGET_MS = 30.0
# Step time grows 0.1 ms per scheduled token over a 5 ms floor; prefix tokens cost 1 us each.
MODEL = LatencyModel(
    s_per_token=1e-4, s_weight_read=0.005, s_per_chunk_prefix_token=1e-6, s_per_decode_seq=1e-4
)
# A mean step target between a decode-only step (5.1 ms) and one that adds a chunk of the batch
# prompt past its first 1,700 tokens (6.8 ms and more): held to it at every step, the prompt would
# stall beside chat.
MEAN_MS = 6.0
ALONE_STEPS = 6  # steps the batch prompt prefills alone before chat arrives
