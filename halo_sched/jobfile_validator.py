"""The compiled job-file validator: GENERATED from halo_sched/models.py by
``python -m halo_sched.jobfile_codegen``; do not edit (tests/test_jobfile_validator.py fails when
it is stale). halo_sched/spec.py builds a pydantic-core SchemaValidator from SCHEMA: the same
checks as the models, building the View classes below instead of the models. It is used only
with the pydantic-core it was generated and tested with; another builds the models instead."""
# ruff: noqa: E501
from . import jobfile_rules as rules, values
from .jobfile_rules import HangMethods, JobSpecMethods, NomadMethods, NotifyMethods, PreflightMethods, SlurmMethods, View

PYDANTIC_CORE = '2.50.5'


class Hang(HangMethods, View):
    __slots__ = ()


class JobSpec(JobSpecMethods, View):
    __slots__ = ()
    _PRIVATE = {'_job_file': None, '_attempt': None}


class Network(View):
    __slots__ = ()


class Nomad(NomadMethods, View):
    __slots__ = ()


class Notify(NotifyMethods, View):
    __slots__ = ()


class Parallelism(View):
    __slots__ = ()


class Preflight(PreflightMethods, View):
    __slots__ = ()


class Rendezvous(View):
    __slots__ = ()


class Retry(View):
    __slots__ = ()


class Server(View):
    __slots__ = ()


class Slurm(SlurmMethods, View):
    __slots__ = ()


class Storage(View):
    __slots__ = ()


class Trainer(View):
    __slots__ = ()


SCHEMA = {
    'type': 'function-after',
    'function': {'type': 'no-info', 'function': rules.job_cross_checks},
    'schema': {
        'type': 'model',
        'cls': JobSpec,
        'schema': {
            'type': 'model-fields',
            'fields': {
                'name': {
                    'type': 'model-field',
                    'schema': {
                        'type': 'function-after',
                        'function': {'type': 'no-info', 'function': rules.job_name},
                        'schema': {'type': 'str'},
                    },
                },
                'nodes': {'type': 'model-field', 'schema': {'type': 'int', 'ge': 1, 'le': 4096}},
                'nproc_per_node': {'type': 'model-field', 'schema': {'type': 'int', 'ge': 1, 'le': 1024}},
                'gpus_per_node': {
                    'type': 'model-field',
                    'schema': {'type': 'default', 'schema': {'type': 'int', 'ge': 0, 'le': 64}, 'default': 0},
                },
                'trainer': {
                    'type': 'model-field',
                    'schema': {
                        'type': 'function-after',
                        'function': {'type': 'no-info', 'function': rules.trainer_one_of},
                        'schema': {
                            'type': 'model',
                            'cls': Trainer,
                            'schema': {
                                'type': 'model-fields',
                                'fields': {
                                    'script': {
                                        'type': 'model-field',
                                        'schema': {
                                            'type': 'default',
                                            'schema': {
                                                'type': 'function-after',
                                                'function': {
                                                    'type': 'no-info',
                                                    'function': rules.trainer_script,
                                                },
                                                'schema': {'type': 'nullable', 'schema': {'type': 'str'}},
                                            },
                                            'default': None,
                                        },
                                    },
                                    'module': {
                                        'type': 'model-field',
                                        'schema': {
                                            'type': 'default',
                                            'schema': {
                                                'type': 'function-after',
                                                'function': {
                                                    'type': 'no-info',
                                                    'function': rules.trainer_module,
                                                },
                                                'schema': {'type': 'nullable', 'schema': {'type': 'str'}},
                                            },
                                            'default': None,
                                        },
                                    },
                                    'args': {
                                        'type': 'model-field',
                                        'schema': {
                                            'type': 'default',
                                            'schema': {
                                                'type': 'function-after',
                                                'function': {'type': 'no-info', 'function': rules.trainer_args},
                                                'schema': {'type': 'list', 'items_schema': {'type': 'str'}},
                                            },
                                            'default_factory': list,
                                            'default_factory_takes_data': False,
                                        },
                                    },
                                },
                                'model_name': 'Trainer',
                                'computed_fields': [],
                            },
                            'custom_init': False,
                            'root_model': False,
                            'config': {
                                'extra_fields_behavior': 'forbid',
                                'str_strip_whitespace': False,
                                'strict': True,
                                'title': 'Trainer',
                            },
                        },
                    },
                },
                'env': {
                    'type': 'model-field',
                    'schema': {
                        'type': 'default',
                        'schema': {
                            'type': 'function-after',
                            'function': {'type': 'no-info', 'function': values.checked_env},
                            'schema': {
                                'type': 'function-before',
                                'function': {'type': 'no-info', 'function': values.env_values_are_text},
                                'schema': {
                                    'type': 'dict',
                                    'keys_schema': {'type': 'str'},
                                    'values_schema': {'type': 'str'},
                                },
                            },
                        },
                        'default_factory': dict,
                        'default_factory_takes_data': False,
                    },
                },
                'secret_env': {
                    'type': 'model-field',
                    'schema': {
                        'type': 'default',
                        'schema': {
                            'type': 'function-after',
                            'function': {'type': 'no-info', 'function': values.checked_secret_names},
                            'schema': {'type': 'list', 'items_schema': {'type': 'str'}},
                        },
                        'default_factory': list,
                        'default_factory_takes_data': False,
                    },
                },
                'setup': {
                    'type': 'model-field',
                    'schema': {
                        'type': 'default',
                        'schema': {
                            'type': 'function-after',
                            'function': {'type': 'no-info', 'function': rules.job_setup},
                            'schema': {
                                'type': 'function-before',
                                'function': {'type': 'no-info', 'function': rules.setup_lines},
                                'schema': {'type': 'list', 'items_schema': {'type': 'str'}},
                            },
                        },
                        'default_factory': list,
                        'default_factory_takes_data': False,
                    },
                },
                'image': {
                    'type': 'model-field',
                    'schema': {
                        'type': 'default',
                        'schema': {
                            'type': 'function-after',
                            'function': {'type': 'no-info', 'function': values.checked_image},
                            'schema': {'type': 'nullable', 'schema': {'type': 'str'}},
                        },
                        'default': None,
                    },
                },
                'rendezvous': {
                    'type': 'model-field',
                    'schema': {
                        'type': 'default',
                        'schema': {
                            'type': 'model',
                            'cls': Rendezvous,
                            'schema': {
                                'type': 'model-fields',
                                'fields': {
                                    'port': {
                                        'type': 'model-field',
                                        'schema': {
                                            'type': 'default',
                                            'schema': {
                                                'type': 'nullable',
                                                'schema': {'type': 'int', 'ge': 1024, 'le': 65535},
                                            },
                                            'default': None,
                                        },
                                    },
                                    'timeout_s': {
                                        'type': 'model-field',
                                        'schema': {
                                            'type': 'default',
                                            'schema': {'type': 'int', 'ge': 1, 'le': 604800},
                                            'default': 900,
                                        },
                                    },
                                },
                                'model_name': 'Rendezvous',
                                'computed_fields': [],
                            },
                            'custom_init': False,
                            'root_model': False,
                            'config': {
                                'extra_fields_behavior': 'forbid',
                                'str_strip_whitespace': False,
                                'strict': True,
                                'title': 'Rendezvous',
                            },
                        },
                        'default_factory': lambda: Rendezvous._default({'port': None, 'timeout_s': 900}),
                        'default_factory_takes_data': False,
                    },
                },
                'storage': {
                    'type': 'model-field',
                    'schema': {
                        'type': 'default',
                        'schema': {
                            'type': 'model',
                            'cls': Storage,
                            'schema': {
                                'type': 'model-fields',
                                'fields': {
                                    'shared': {
                                        'type': 'model-field',
                                        'schema': {
                                            'type': 'default',
                                            'schema': {'type': 'bool'},
                                            'default': True,
                                        },
                                    },
                                    'input_shared': {
                                        'type': 'model-field',
                                        'schema': {
                                            'type': 'default',
                                            'schema': {'type': 'nullable', 'schema': {'type': 'bool'}},
                                            'default': None,
                                        },
                                    },
                                    'output_shared': {
                                        'type': 'model-field',
                                        'schema': {
                                            'type': 'default',
                                            'schema': {'type': 'nullable', 'schema': {'type': 'bool'}},
                                            'default': None,
                                        },
                                    },
                                    'store_timeout_hours': {
                                        'type': 'model-field',
                                        'schema': {
                                            'type': 'default',
                                            'schema': {
                                                'type': 'float',
                                                'gt': 0,
                                                'le': 168,
                                                'allow_inf_nan': False,
                                            },
                                            'default': 4,
                                        },
                                    },
                                    'nccl_timeout_minutes': {
                                        'type': 'model-field',
                                        'schema': {
                                            'type': 'default',
                                            'schema': {
                                                'type': 'nullable',
                                                'schema': {'type': 'int', 'ge': 1, 'le': 10080},
                                            },
                                            'default': None,
                                        },
                                    },
                                },
                                'model_name': 'Storage',
                                'computed_fields': [],
                            },
                            'custom_init': False,
                            'root_model': False,
                            'config': {
                                'extra_fields_behavior': 'forbid',
                                'str_strip_whitespace': False,
                                'strict': True,
                                'title': 'Storage',
                            },
                        },
                        'default_factory': lambda: Storage._default({'shared': True, 'input_shared': None, 'output_shared': None, 'store_timeout_hours': 4, 'nccl_timeout_minutes': None}),
                        'default_factory_takes_data': False,
                    },
                },
                'network': {
                    'type': 'model-field',
                    'schema': {
                        'type': 'default',
                        'schema': {
                            'type': 'function-after',
                            'function': {'type': 'no-info', 'function': rules.network_ep},
                            'schema': {
                                'type': 'model',
                                'cls': Network,
                                'schema': {
                                    'type': 'model-fields',
                                    'fields': {
                                        'interface': {
                                            'type': 'model-field',
                                            'schema': {
                                                'type': 'default',
                                                'schema': {
                                                    'type': 'function-after',
                                                    'function': {
                                                        'type': 'no-info',
                                                        'function': rules.network_iface,
                                                    },
                                                    'schema': {'type': 'nullable', 'schema': {'type': 'str'}},
                                                },
                                                'default': None,
                                            },
                                        },
                                        'fabric': {
                                            'type': 'model-field',
                                            'schema': {
                                                'type': 'default',
                                                'schema': {
                                                    'type': 'literal',
                                                    'expected': ['default', 'infiniband', 'roce', 'efa'],
                                                },
                                                'default': 'default',
                                            },
                                        },
                                        'cross_node_expert_parallel': {
                                            'type': 'model-field',
                                            'schema': {
                                                'type': 'default',
                                                'schema': {'type': 'bool'},
                                                'default': False,
                                            },
                                        },
                                        'nccl_proto_simple': {
                                            'type': 'model-field',
                                            'schema': {
                                                'type': 'default',
                                                'schema': {'type': 'bool'},
                                                'default': False,
                                            },
                                        },
                                        'nccl_debug': {
                                            'type': 'model-field',
                                            'schema': {
                                                'type': 'default',
                                                'schema': {
                                                    'type': 'literal',
                                                    'expected': ['', 'WARN', 'INFO', 'TRACE'],
                                                },
                                                'default': '',
                                            },
                                        },
                                    },
                                    'model_name': 'Network',
                                    'computed_fields': [],
                                },
                                'custom_init': False,
                                'root_model': False,
                                'config': {
                                    'extra_fields_behavior': 'forbid',
                                    'str_strip_whitespace': False,
                                    'strict': True,
                                    'title': 'Network',
                                },
                            },
                        },
                        'default_factory': lambda: Network._default({'interface': None, 'fabric': 'default', 'cross_node_expert_parallel': False, 'nccl_proto_simple': False, 'nccl_debug': ''}),
                        'default_factory_takes_data': False,
                    },
                },
                'slurm': {
                    'type': 'model-field',
                    'schema': {
                        'type': 'default',
                        'schema': {
                            'type': 'function-after',
                            'function': {'type': 'no-info', 'function': rules.slurm_extra_conflicts},
                            'schema': {
                                'type': 'model',
                                'cls': Slurm,
                                'schema': {
                                    'type': 'model-fields',
                                    'fields': {
                                        'partition': {
                                            'type': 'model-field',
                                            'schema': {
                                                'type': 'default',
                                                'schema': {
                                                    'type': 'function-before',
                                                    'function': {
                                                        'type': 'no-info',
                                                        'function': rules.slurm_quoted,
                                                    },
                                                    'schema': {
                                                        'type': 'function-after',
                                                        'function': {
                                                            'type': 'no-info',
                                                            'function': rules.slurm_word,
                                                        },
                                                        'schema': {
                                                            'type': 'nullable',
                                                            'schema': {'type': 'str'},
                                                        },
                                                    },
                                                },
                                                'default': None,
                                            },
                                        },
                                        'account': {
                                            'type': 'model-field',
                                            'schema': {
                                                'type': 'default',
                                                'schema': {
                                                    'type': 'function-before',
                                                    'function': {
                                                        'type': 'no-info',
                                                        'function': rules.slurm_quoted,
                                                    },
                                                    'schema': {
                                                        'type': 'function-after',
                                                        'function': {
                                                            'type': 'no-info',
                                                            'function': rules.slurm_word,
                                                        },
                                                        'schema': {
                                                            'type': 'nullable',
                                                            'schema': {'type': 'str'},
                                                        },
                                                    },
                                                },
                                                'default': None,
                                            },
                                        },
                                        'qos': {
                                            'type': 'model-field',
                                            'schema': {
                                                'type': 'default',
                                                'schema': {
                                                    'type': 'function-before',
                                                    'function': {
                                                        'type': 'no-info',
                                                        'function': rules.slurm_quoted,
                                                    },
                                                    'schema': {
                                                        'type': 'function-after',
                                                        'function': {
                                                            'type': 'no-info',
                                                            'function': rules.slurm_word,
                                                        },
                                                        'schema': {
                                                            'type': 'nullable',
                                                            'schema': {'type': 'str'},
                                                        },
                                                    },
                                                },
                                                'default': None,
                                            },
                                        },
                                        'time': {
                                            'type': 'model-field',
                                            'schema': {
                                                'type': 'default',
                                                'schema': {
                                                    'type': 'function-after',
                                                    'function': {
                                                        'type': 'no-info',
                                                        'function': rules.slurm_time,
                                                    },
                                                    'schema': {
                                                        'type': 'function-before',
                                                        'function': {
                                                            'type': 'no-info',
                                                            'function': rules.slurm_quoted,
                                                        },
                                                        'schema': {
                                                            'type': 'nullable',
                                                            'schema': {'type': 'str'},
                                                        },
                                                    },
                                                },
                                                'default': None,
                                            },
                                        },
                                        'constraint': {
                                            'type': 'model-field',
                                            'schema': {
                                                'type': 'default',
                                                'schema': {
                                                    'type': 'function-before',
                                                    'function': {
                                                        'type': 'no-info',
                                                        'function': rules.slurm_quoted,
                                                    },
                                                    'schema': {
                                                        'type': 'function-after',
                                                        'function': {
                                                            'type': 'no-info',
                                                            'function': rules.slurm_constraint,
                                                        },
                                                        'schema': {
                                                            'type': 'nullable',
                                                            'schema': {'type': 'str'},
                                                        },
                                                    },
                                                },
                                                'default': None,
                                            },
                                        },
                                        'exclusive': {
                                            'type': 'model-field',
                                            'schema': {
                                                'type': 'default',
                                                'schema': {'type': 'bool'},
                                                'default': False,
                                            },
                                        },
                                        'cpus_per_task': {
                                            'type': 'model-field',
                                            'schema': {
                                                'type': 'default',
                                                'schema': {
                                                    'type': 'nullable',
                                                    'schema': {'type': 'int', 'ge': 1, 'le': 65533},
                                                },
                                                'default': None,
                                            },
                                        },
                                        'mem': {
                                            'type': 'model-field',
                                            'schema': {
                                                'type': 'default',
                                                'schema': {
                                                    'type': 'function-before',
                                                    'function': {
                                                        'type': 'no-info',
                                                        'function': rules.slurm_quoted,
                                                    },
                                                    'schema': {
                                                        'type': 'function-after',
                                                        'function': {
                                                            'type': 'no-info',
                                                            'function': rules.slurm_mem,
                                                        },
                                                        'schema': {
                                                            'type': 'nullable',
                                                            'schema': {'type': 'str'},
                                                        },
                                                    },
                                                },
                                                'default': None,
                                            },
                                        },
                                        'signal': {
                                            'type': 'model-field',
                                            'schema': {
                                                'type': 'default',
                                                'schema': {
                                                    'type': 'function-after',
                                                    'function': {
                                                        'type': 'no-info',
                                                        'function': rules.slurm_signal,
                                                    },
                                                    'schema': {'type': 'nullable', 'schema': {'type': 'str'}},
                                                },
                                                'default': None,
                                            },
                                        },
                                        'requeue': {
                                            'type': 'model-field',
                                            'schema': {
                                                'type': 'default',
                                                'schema': {'type': 'nullable', 'schema': {'type': 'bool'}},
                                                'default': None,
                                            },
                                        },
                                        'max_requeues': {
                                            'type': 'model-field',
                                            'schema': {
                                                'type': 'default',
                                                'schema': {'type': 'int', 'ge': 0, 'le': 1000},
                                                'default': 3,
                                            },
                                        },
                                        'container_workdir': {
                                            'type': 'model-field',
                                            'schema': {
                                                'type': 'default',
                                                'schema': {
                                                    'type': 'function-after',
                                                    'function': {
                                                        'type': 'no-info',
                                                        'function': rules.slurm_workdir,
                                                    },
                                                    'schema': {'type': 'nullable', 'schema': {'type': 'str'}},
                                                },
                                                'default': None,
                                            },
                                        },
                                        'container_runtime': {
                                            'type': 'model-field',
                                            'schema': {
                                                'type': 'default',
                                                'schema': {'type': 'literal', 'expected': ['pyxis', 'none']},
                                                'default': 'pyxis',
                                            },
                                        },
                                        'container_mounts': {
                                            'type': 'model-field',
                                            'schema': {
                                                'type': 'default',
                                                'schema': {
                                                    'type': 'function-after',
                                                    'function': {
                                                        'type': 'no-info',
                                                        'function': rules.slurm_mounts,
                                                    },
                                                    'schema': {
                                                        'type': 'list',
                                                        'items_schema': {'type': 'str'},
                                                    },
                                                },
                                                'default_factory': list,
                                                'default_factory_takes_data': False,
                                            },
                                        },
                                        'extra_args': {
                                            'type': 'model-field',
                                            'schema': {
                                                'type': 'default',
                                                'schema': {
                                                    'type': 'function-after',
                                                    'function': {
                                                        'type': 'no-info',
                                                        'function': rules.slurm_extra,
                                                    },
                                                    'schema': {
                                                        'type': 'list',
                                                        'items_schema': {'type': 'str'},
                                                    },
                                                },
                                                'default_factory': list,
                                                'default_factory_takes_data': False,
                                            },
                                        },
                                    },
                                    'model_name': 'Slurm',
                                    'computed_fields': [],
                                },
                                'custom_init': False,
                                'root_model': False,
                                'config': {
                                    'extra_fields_behavior': 'forbid',
                                    'str_strip_whitespace': False,
                                    'strict': True,
                                    'title': 'Slurm',
                                },
                            },
                        },
                        'default_factory': lambda: Slurm._default({'partition': None, 'account': None, 'qos': None, 'time': None, 'constraint': None, 'exclusive': False, 'cpus_per_task': None, 'mem': None, 'signal': None, 'requeue': None, 'max_requeues': 3, 'container_workdir': None, 'container_runtime': 'pyxis', 'container_mounts': [], 'extra_args': []}),
                        'default_factory_takes_data': False,
                    },
                },
                'nomad': {
                    'type': 'model-field',
                    'schema': {
                        'type': 'default',
                        'schema': {
                            'type': 'function-after',
                            'function': {'type': 'no-info', 'function': rules.nomad_shm_fits},
                            'schema': {
                                'type': 'function-after',
                                'function': {'type': 'no-info', 'function': rules.nomad_docker_only},
                                'schema': {
                                    'type': 'model',
                                    'cls': Nomad,
                                    'schema': {
                                        'type': 'model-fields',
                                        'fields': {
                                            'datacenters': {
                                                'type': 'model-field',
                                                'schema': {
                                                    'type': 'default',
                                                    'schema': {
                                                        'type': 'function-after',
                                                        'function': {
                                                            'type': 'no-info',
                                                            'function': rules.nomad_dcs,
                                                        },
                                                        'schema': {
                                                            'type': 'list',
                                                            'items_schema': {'type': 'str'},
                                                        },
                                                    },
                                                    'default_factory': lambda: ['*'],
                                                    'default_factory_takes_data': False,
                                                },
                                            },
                                            'namespace': {
                                                'type': 'model-field',
                                                'schema': {
                                                    'type': 'default',
                                                    'schema': {
                                                        'type': 'function-after',
                                                        'function': {
                                                            'type': 'no-info',
                                                            'function': rules.nomad_namespace,
                                                        },
                                                        'schema': {
                                                            'type': 'nullable',
                                                            'schema': {'type': 'str'},
                                                        },
                                                    },
                                                    'default': None,
                                                },
                                            },
                                            'region': {
                                                'type': 'model-field',
                                                'schema': {
                                                    'type': 'default',
                                                    'schema': {
                                                        'type': 'function-after',
                                                        'function': {
                                                            'type': 'no-info',
                                                            'function': rules.nomad_region,
                                                        },
                                                        'schema': {
                                                            'type': 'nullable',
                                                            'schema': {'type': 'str'},
                                                        },
                                                    },
                                                    'default': None,
                                                },
                                            },
                                            'driver': {
                                                'type': 'model-field',
                                                'schema': {
                                                    'type': 'default',
                                                    'schema': {
                                                        'type': 'literal',
                                                        'expected': ['docker', 'exec', 'raw_exec'],
                                                    },
                                                    'default': 'docker',
                                                },
                                            },
                                            'max_run_duration': {
                                                'type': 'model-field',
                                                'schema': {
                                                    'type': 'default',
                                                    'schema': {
                                                        'type': 'function-after',
                                                        'function': {
                                                            'type': 'no-info',
                                                            'function': rules.nomad_dur,
                                                        },
                                                        'schema': {
                                                            'type': 'nullable',
                                                            'schema': {'type': 'str'},
                                                        },
                                                    },
                                                    'default': None,
                                                },
                                            },
                                            'placement_timeout_s': {
                                                'type': 'model-field',
                                                'schema': {
                                                    'type': 'default',
                                                    'schema': {
                                                        'type': 'nullable',
                                                        'schema': {'type': 'int', 'ge': 1, 'le': 604800},
                                                    },
                                                    'default': None,
                                                },
                                            },
                                            'cpu': {
                                                'type': 'model-field',
                                                'schema': {
                                                    'type': 'default',
                                                    'schema': {'type': 'int', 'ge': 1, 'le': 10000000},
                                                    'default': 1000,
                                                },
                                            },
                                            'memory': {
                                                'type': 'model-field',
                                                'schema': {
                                                    'type': 'default',
                                                    'schema': {'type': 'int', 'ge': 16, 'le': 134217728},
                                                    'default': 4096,
                                                },
                                            },
                                            'shm_size': {
                                                'type': 'model-field',
                                                'schema': {
                                                    'type': 'default',
                                                    'schema': {
                                                        'type': 'function-before',
                                                        'function': {
                                                            'type': 'no-info',
                                                            'function': rules.nomad_shm,
                                                        },
                                                        'schema': {
                                                            'type': 'nullable',
                                                            'schema': {
                                                                'type': 'union',
                                                                'choices': [{'type': 'int'}, {'type': 'str'}],
                                                            },
                                                        },
                                                    },
                                                    'default': None,
                                                },
                                            },
                                            'volumes': {
                                                'type': 'model-field',
                                                'schema': {
                                                    'type': 'default',
                                                    'schema': {
                                                        'type': 'function-after',
                                                        'function': {
                                                            'type': 'no-info',
                                                            'function': rules.nomad_vols,
                                                        },
                                                        'schema': {
                                                            'type': 'list',
                                                            'items_schema': {'type': 'str'},
                                                        },
                                                    },
                                                    'default_factory': list,
                                                    'default_factory_takes_data': False,
                                                },
                                            },
                                            'priority': {
                                                'type': 'model-field',
                                                'schema': {
                                                    'type': 'default',
                                                    'schema': {
                                                        'type': 'nullable',
                                                        'schema': {'type': 'int', 'ge': 1, 'le': 100},
                                                    },
                                                    'default': None,
                                                },
                                            },
                                            'user': {
                                                'type': 'model-field',
                                                'schema': {
                                                    'type': 'default',
                                                    'schema': {
                                                        'type': 'function-after',
                                                        'function': {
                                                            'type': 'no-info',
                                                            'function': rules.nomad_user,
                                                        },
                                                        'schema': {
                                                            'type': 'nullable',
                                                            'schema': {'type': 'str'},
                                                        },
                                                    },
                                                    'default': None,
                                                },
                                            },
                                        },
                                        'model_name': 'Nomad',
                                        'computed_fields': [],
                                    },
                                    'custom_init': False,
                                    'root_model': False,
                                    'config': {
                                        'extra_fields_behavior': 'forbid',
                                        'str_strip_whitespace': False,
                                        'strict': True,
                                        'title': 'Nomad',
                                    },
                                },
                            },
                        },
                        'default_factory': lambda: Nomad._default({'datacenters': ['*'], 'namespace': None, 'region': None, 'driver': 'docker', 'max_run_duration': None, 'placement_timeout_s': None, 'cpu': 1000, 'memory': 4096, 'shm_size': None, 'volumes': [], 'priority': None, 'user': None}),
                        'default_factory_takes_data': False,
                    },
                },
                'avoid_ledgered_nodes': {
                    'type': 'model-field',
                    'schema': {'type': 'default', 'schema': {'type': 'bool'}, 'default': True},
                },
                'hang': {
                    'type': 'model-field',
                    'schema': {
                        'type': 'default',
                        'schema': {
                            'type': 'nullable',
                            'schema': {
                                'type': 'model',
                                'cls': Hang,
                                'schema': {
                                    'type': 'model-fields',
                                    'fields': {
                                        'timeout_s': {
                                            'type': 'model-field',
                                            'schema': {
                                                'type': 'default',
                                                'schema': {'type': 'int', 'ge': 10, 'le': 604800},
                                                'default': 300,
                                            },
                                        },
                                        'first_step_s': {
                                            'type': 'model-field',
                                            'schema': {
                                                'type': 'default',
                                                'schema': {
                                                    'type': 'nullable',
                                                    'schema': {'type': 'int', 'ge': 10, 'le': 604800},
                                                },
                                                'default': None,
                                            },
                                        },
                                    },
                                    'model_name': 'Hang',
                                    'computed_fields': [],
                                },
                                'custom_init': False,
                                'root_model': False,
                                'config': {
                                    'extra_fields_behavior': 'forbid',
                                    'str_strip_whitespace': False,
                                    'strict': True,
                                    'title': 'Hang',
                                },
                            },
                        },
                        'default_factory': lambda: Hang._default({'timeout_s': 300, 'first_step_s': None}),
                        'default_factory_takes_data': False,
                    },
                },
                'preflight': {
                    'type': 'model-field',
                    'schema': {
                        'type': 'default',
                        'schema': {
                            'type': 'function-after',
                            'function': {'type': 'no-info', 'function': rules.preflight_busbw_needs_gate},
                            'schema': {
                                'type': 'model',
                                'cls': Preflight,
                                'schema': {
                                    'type': 'model-fields',
                                    'fields': {
                                        'gate': {
                                            'type': 'model-field',
                                            'schema': {
                                                'type': 'default',
                                                'schema': {'type': 'bool'},
                                                'default': False,
                                            },
                                        },
                                        'min_busbw': {
                                            'type': 'model-field',
                                            'schema': {
                                                'type': 'default',
                                                'schema': {
                                                    'type': 'function-before',
                                                    'function': {
                                                        'type': 'no-info',
                                                        'function': rules.preflight_busbw,
                                                    },
                                                    'schema': {'type': 'nullable', 'schema': {'type': 'str'}},
                                                },
                                                'default': None,
                                            },
                                        },
                                    },
                                    'model_name': 'Preflight',
                                    'computed_fields': [],
                                },
                                'custom_init': False,
                                'root_model': False,
                                'config': {
                                    'extra_fields_behavior': 'forbid',
                                    'str_strip_whitespace': False,
                                    'strict': True,
                                    'title': 'Preflight',
                                },
                            },
                        },
                        'default_factory': lambda: Preflight._default({'gate': False, 'min_busbw': None}),
                        'default_factory_takes_data': False,
                    },
                },
                'notify': {
                    'type': 'model-field',
                    'schema': {
                        'type': 'default',
                        'schema': {
                            'type': 'nullable',
                            'schema': {
                                'type': 'model',
                                'cls': Notify,
                                'schema': {
                                    'type': 'model-fields',
                                    'fields': {
                                        'webhook_env': {
                                            'type': 'model-field',
                                            'schema': {
                                                'type': 'function-after',
                                                'function': {'type': 'no-info', 'function': rules.notify_name},
                                                'schema': {'type': 'str'},
                                            },
                                        },
                                        'on': {
                                            'type': 'model-field',
                                            'schema': {
                                                'type': 'default',
                                                'schema': {
                                                    'type': 'function-after',
                                                    'function': {
                                                        'type': 'no-info',
                                                        'function': rules.notify_once,
                                                    },
                                                    'schema': {
                                                        'type': 'list',
                                                        'items_schema': {
                                                            'type': 'literal',
                                                            'expected': ['failed', 'hung', 'retried', 'completed'],
                                                        },
                                                        'min_length': 1,
                                                    },
                                                },
                                                'default_factory': lambda: ['failed', 'hung', 'retried', 'completed'],
                                                'default_factory_takes_data': False,
                                            },
                                        },
                                    },
                                    'model_name': 'Notify',
                                    'computed_fields': [],
                                },
                                'custom_init': False,
                                'root_model': False,
                                'config': {
                                    'extra_fields_behavior': 'forbid',
                                    'str_strip_whitespace': False,
                                    'strict': True,
                                    'title': 'Notify',
                                },
                            },
                        },
                        'default': None,
                    },
                },
                'retry': {
                    'type': 'model-field',
                    'schema': {
                        'type': 'default',
                        'schema': {
                            'type': 'nullable',
                            'schema': {
                                'type': 'model',
                                'cls': Retry,
                                'schema': {
                                    'type': 'model-fields',
                                    'fields': {
                                        'attempts': {
                                            'type': 'model-field',
                                            'schema': {'type': 'int', 'ge': 1, 'le': 20},
                                        },
                                        'on': {
                                            'type': 'model-field',
                                            'schema': {
                                                'type': 'default',
                                                'schema': {
                                                    'type': 'list',
                                                    'items_schema': {
                                                        'type': 'literal',
                                                        'expected': ['node', 'hang', 'preflight'],
                                                    },
                                                    'min_length': 1,
                                                },
                                                'default_factory': lambda: ['node'],
                                                'default_factory_takes_data': False,
                                            },
                                        },
                                    },
                                    'model_name': 'Retry',
                                    'computed_fields': [],
                                },
                                'custom_init': False,
                                'root_model': False,
                                'config': {
                                    'extra_fields_behavior': 'forbid',
                                    'str_strip_whitespace': False,
                                    'strict': True,
                                    'title': 'Retry',
                                },
                            },
                        },
                        'default': None,
                    },
                },
                'parallelism': {
                    'type': 'model-field',
                    'schema': {
                        'type': 'default',
                        'schema': {
                            'type': 'nullable',
                            'schema': {
                                'type': 'model',
                                'cls': Parallelism,
                                'schema': {
                                    'type': 'model-fields',
                                    'fields': {
                                        'tp': {
                                            'type': 'model-field',
                                            'schema': {
                                                'type': 'default',
                                                'schema': {'type': 'int', 'ge': 1, 'le': 4096},
                                                'default': 1,
                                            },
                                        },
                                        'ep': {
                                            'type': 'model-field',
                                            'schema': {
                                                'type': 'default',
                                                'schema': {'type': 'int', 'ge': 1, 'le': 65536},
                                                'default': 1,
                                            },
                                        },
                                        'etp': {
                                            'type': 'model-field',
                                            'schema': {
                                                'type': 'default',
                                                'schema': {'type': 'int', 'ge': 1, 'le': 4096},
                                                'default': 1,
                                            },
                                        },
                                        'cp': {
                                            'type': 'model-field',
                                            'schema': {
                                                'type': 'default',
                                                'schema': {'type': 'int', 'ge': 1, 'le': 4096},
                                                'default': 1,
                                            },
                                        },
                                        'hsdp': {
                                            'type': 'model-field',
                                            'schema': {
                                                'type': 'default',
                                                'schema': {'type': 'bool'},
                                                'default': False,
                                            },
                                        },
                                        'ep_scope': {
                                            'type': 'model-field',
                                            'schema': {
                                                'type': 'default',
                                                'schema': {
                                                    'type': 'literal',
                                                    'expected': ['auto', 'node', 'global'],
                                                },
                                                'default': 'auto',
                                            },
                                        },
                                        'nvlink_domain_size': {
                                            'type': 'model-field',
                                            'schema': {
                                                'type': 'default',
                                                'schema': {
                                                    'type': 'nullable',
                                                    'schema': {'type': 'int', 'ge': 1, 'le': 65536},
                                                },
                                                'default': None,
                                            },
                                        },
                                    },
                                    'model_name': 'Parallelism',
                                    'computed_fields': [],
                                },
                                'custom_init': False,
                                'root_model': False,
                                'config': {
                                    'extra_fields_behavior': 'forbid',
                                    'str_strip_whitespace': False,
                                    'strict': True,
                                    'title': 'Parallelism',
                                },
                            },
                        },
                        'default': None,
                    },
                },
                'servers': {
                    'type': 'model-field',
                    'schema': {
                        'type': 'default',
                        'schema': {
                            'type': 'list',
                            'items_schema': {
                                'type': 'function-after',
                                'function': {'type': 'no-info', 'function': rules.server_process_size},
                                'schema': {
                                    'type': 'model',
                                    'cls': Server,
                                    'schema': {
                                        'type': 'model-fields',
                                        'fields': {
                                            'name': {
                                                'type': 'model-field',
                                                'schema': {
                                                    'type': 'function-after',
                                                    'function': {
                                                        'type': 'no-info',
                                                        'function': rules.server_name,
                                                    },
                                                    'schema': {'type': 'str'},
                                                },
                                            },
                                            'nodes': {
                                                'type': 'model-field',
                                                'schema': {'type': 'int', 'ge': 1, 'le': 1024},
                                            },
                                            'gpus_per_node': {
                                                'type': 'model-field',
                                                'schema': {
                                                    'type': 'default',
                                                    'schema': {'type': 'int', 'ge': 0, 'le': 64},
                                                    'default': 0,
                                                },
                                            },
                                            'command': {
                                                'type': 'model-field',
                                                'schema': {
                                                    'type': 'function-after',
                                                    'function': {
                                                        'type': 'no-info',
                                                        'function': rules.server_command,
                                                    },
                                                    'schema': {
                                                        'type': 'list',
                                                        'items_schema': {'type': 'str'},
                                                    },
                                                },
                                            },
                                            'port': {
                                                'type': 'model-field',
                                                'schema': {'type': 'int', 'ge': 1024, 'le': 65535},
                                            },
                                            'group_port': {
                                                'type': 'model-field',
                                                'schema': {
                                                    'type': 'default',
                                                    'schema': {
                                                        'type': 'nullable',
                                                        'schema': {'type': 'int', 'ge': 1024, 'le': 65535},
                                                    },
                                                    'default': None,
                                                },
                                            },
                                            'health_path': {
                                                'type': 'model-field',
                                                'schema': {
                                                    'type': 'default',
                                                    'schema': {
                                                        'type': 'function-after',
                                                        'function': {
                                                            'type': 'no-info',
                                                            'function': rules.server_health,
                                                        },
                                                        'schema': {'type': 'str'},
                                                    },
                                                    'default': '/health',
                                                },
                                            },
                                            'image': {
                                                'type': 'model-field',
                                                'schema': {
                                                    'type': 'default',
                                                    'schema': {
                                                        'type': 'function-after',
                                                        'function': {
                                                            'type': 'no-info',
                                                            'function': values.checked_image,
                                                        },
                                                        'schema': {
                                                            'type': 'nullable',
                                                            'schema': {'type': 'str'},
                                                        },
                                                    },
                                                    'default': None,
                                                },
                                            },
                                            'env': {
                                                'type': 'model-field',
                                                'schema': {
                                                    'type': 'default',
                                                    'schema': {
                                                        'type': 'function-after',
                                                        'function': {
                                                            'type': 'no-info',
                                                            'function': values.checked_env,
                                                        },
                                                        'schema': {
                                                            'type': 'function-before',
                                                            'function': {
                                                                'type': 'no-info',
                                                                'function': values.env_values_are_text,
                                                            },
                                                            'schema': {
                                                                'type': 'dict',
                                                                'keys_schema': {'type': 'str'},
                                                                'values_schema': {'type': 'str'},
                                                            },
                                                        },
                                                    },
                                                    'default_factory': dict,
                                                    'default_factory_takes_data': False,
                                                },
                                            },
                                            'secret_env': {
                                                'type': 'model-field',
                                                'schema': {
                                                    'type': 'default',
                                                    'schema': {
                                                        'type': 'function-after',
                                                        'function': {
                                                            'type': 'no-info',
                                                            'function': values.checked_secret_names,
                                                        },
                                                        'schema': {
                                                            'type': 'list',
                                                            'items_schema': {'type': 'str'},
                                                        },
                                                    },
                                                    'default_factory': list,
                                                    'default_factory_takes_data': False,
                                                },
                                            },
                                            'setup': {
                                                'type': 'model-field',
                                                'schema': {
                                                    'type': 'default',
                                                    'schema': {
                                                        'type': 'function-after',
                                                        'function': {
                                                            'type': 'no-info',
                                                            'function': rules.server_setup,
                                                        },
                                                        'schema': {
                                                            'type': 'function-before',
                                                            'function': {
                                                                'type': 'no-info',
                                                                'function': rules.setup_lines,
                                                            },
                                                            'schema': {
                                                                'type': 'list',
                                                                'items_schema': {'type': 'str'},
                                                            },
                                                        },
                                                    },
                                                    'default_factory': list,
                                                    'default_factory_takes_data': False,
                                                },
                                            },
                                        },
                                        'model_name': 'Server',
                                        'computed_fields': [],
                                    },
                                    'custom_init': False,
                                    'root_model': False,
                                    'config': {
                                        'extra_fields_behavior': 'forbid',
                                        'str_strip_whitespace': False,
                                        'strict': True,
                                        'title': 'Server',
                                    },
                                },
                            },
                        },
                        'default_factory': list,
                        'default_factory_takes_data': False,
                    },
                },
            },
            'model_name': 'JobSpec',
            'computed_fields': [],
        },
        'custom_init': False,
        'root_model': False,
        'config': {
            'extra_fields_behavior': 'forbid',
            'str_strip_whitespace': False,
            'strict': True,
            'title': 'JobSpec',
        },
    },
}
