"""What holds device memory: variables, `%gpumem free`, leak hints, OOM post-mortems."""
