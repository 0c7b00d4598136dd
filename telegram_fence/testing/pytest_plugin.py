"""pytest fixtures for bots built on telegram_fence (loaded through the ``pytest11`` entry point)."""
