"""Perseus-style GPU frequency planning on the iteration time–energy frontier (see ``docs/energy.md``)."""
