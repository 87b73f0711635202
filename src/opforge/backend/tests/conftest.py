"""The backend's own tests run against the tree OPDEV_ROOT names (default: the shipped one), on two devices."""
import os

os.environ.setdefault("OPDEV_DEVICE_COUNT", "2")
