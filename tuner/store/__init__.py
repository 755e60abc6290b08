"""Where a study lives: ``handle`` (the study folder with its Optuna storage, the folder's
lock, the pinned environment, the budget), ``storage_lock`` (one run per study and storage),
``records`` (trials read back from a storage), ``folder`` (a study rebuilt from its trial
files alone) and ``spec_guard`` (every reader holds spec.yaml to what the study recorded)."""
