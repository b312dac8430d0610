module holdwarden.local/controllerbuild/trainer

go 1.26.0

require github.com/kubeflow/trainer/v2 v2.2.1
