"""Build the optional compiled rANS kernel; everything else lives in pyproject.toml.

`optional=True`: without a C compiler or Python's headers the install still
succeeds and recurnorm codes the same bytes with its numpy reference (slower).
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "recurnorm.budget._ransc",
            sources=["recurnorm/budget/_ransc.c"],
            extra_compile_args=["-O3"],
            optional=True,
        )
    ]
)
