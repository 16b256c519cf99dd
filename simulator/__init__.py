"""A discrete-event vLLM-like replica in virtual time, driving the same controller as production."""
