"""Start and stop the real tritonserver, the python-backend runners, and the runtime view of a repository."""
