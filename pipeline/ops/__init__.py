"""Operations around the jobs: commit, incremental runs, storage, runners, progress, run log, schedules."""
