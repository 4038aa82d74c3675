"""JupyterHub for the course on one shared node: each learner's server, kernel and ranks run as
that learner's own Unix user; tests/runtime/test_jupyterhub.py starts the hub with this very file.

As root, from an environment every learner can read (README, "Host the course on a JupyterHub"):
    jupyterhub -f jupyter/jupyterhub_config.py
"""
import os
import sys

c = get_config()  # noqa: F821 - JupyterHub's config loader defines it

# Behind your TLS proxy; learners reach the hub through it, never the single-user servers' ports
c.JupyterHub.ip = "127.0.0.1"
c.JupyterHub.port = 8000
c.JupyterHub.hub_ip = "127.0.0.1"

# The proxy from PyPI (pip install configurable-http-proxy): no Node.js on the node. It gives a
# server 20 s to answer unless told (tornado's default): a kernel's websocket on a loaded node needs more
c.ConfigurableHTTPProxy.command = [os.path.join(os.path.dirname(sys.executable), "configurable-http-proxy"),
                                   "--proxy-timeout", "300000"]

# Each learner's Jupyter server as that learner (a system account: useradd -m -K HOME_MODE=0700),
# from the Python the course is installed in; PAM (the default) checks their passwords
c.JupyterHub.spawner_class = "localprocess"
c.Spawner.cmd = [sys.executable, "-m", "jupyterhub.singleuser"]
c.Spawner.default_url = "/lab"
c.LocalProcessSpawner.popen_kwargs = {"umask": 0o077}  # what a learner's processes make is theirs alone
c.Spawner.start_timeout = 120  # a loaded node: the server imports JupyterLab in seconds, not ms
c.Spawner.http_timeout = 120
# The learner's share of the node: threads per rank come from it (course_lib's cpu_cores), as they
# do from a cgroup quota (a spawner that sets cpu_limit through systemd) and the CPU affinity
c.Spawner.environment = {"OMP_NUM_THREADS": "2"}
c.Authenticator.allow_all = True  # every system account; or c.Authenticator.allowed_users = {...}
