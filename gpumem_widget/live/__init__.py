"""Live monitoring: readers → sampler → timeline; cell hooks → tracker → ledger; the publisher."""
