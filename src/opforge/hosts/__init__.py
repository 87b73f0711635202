"""Export opforge's skills and roles to agent hosts (Claude Code, OpenCode, Codex, Cursor), and check skills."""
