"""A sweep: the grid of runs an experiment file names, the plan of what they cost, how they train
(in this process or one process per run) and are followed, and the set of runs a study should
have. It builds on `training` (one run) and is used by the commands (`sweep`, `report`).
"""
