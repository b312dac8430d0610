module holdwarden.local/nodeimages/hello

go 1.26.0
