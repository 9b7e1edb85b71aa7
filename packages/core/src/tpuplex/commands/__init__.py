"""The commands (`tpuplex train`, `eval`, `predict`, `export`, `sweep`, `report`, `launch`, `prepare`): the CLI
(`cli`) and the pipelines behind it (`run`: a training run; `workflow`: evaluation and prediction of a finished
run; `run_folder`: a run folder and its checkpoints, read back)."""
