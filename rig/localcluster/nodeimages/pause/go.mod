module holdwarden.local/nodeimages/pause

go 1.26.0
