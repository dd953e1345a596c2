"""The run kit, the local and Ray runners, records, traces and plots."""
