"""Per-family code: template parameters and launch manifests for each kernel family."""
