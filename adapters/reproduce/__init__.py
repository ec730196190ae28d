"""`pivotrl reproduce`: the paper's claims at small scale, as resumable, seeded stages with a verdict per claim.

`scales` holds the sizes (quick, cpu, gpu), `stages` the resumable stage store, `experiments` the
stages themselves (split, base warm-up, profiling, training arms, theorem checks, end-to-end RL
through `e2e`), `measure` what is measured on a policy, `stats` the intervals and the verdict rule,
`claims` the claims decided from the stages' results, `report` the markdown, JSON and plots, and
`runner.reproduce` the whole of it. See docs/reproduce.md.
"""
