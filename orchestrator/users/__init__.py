"""Users: their records and group memberships, the gids of group workspaces, the directories
of each user on the host and the files the host writes into them."""
