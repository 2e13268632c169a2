"""The datasets tinyvit knows: MNIST, Fashion-MNIST and CIFAR-10, each with its
official files, checksums, mirrors, class names and pixel statistics."""

from dataclasses import dataclass, field

SPLITS = ("train", "test")


class DatasetError(ValueError):
    """A dataset file (or an image given to classify) is missing, corrupted or
    not what it should be."""


@dataclass(frozen=True)
class Archive:
    """An official tarball: where to get it and its published MD5."""

    url: str
    md5: str

    @property
    def filename(self):
        return self.url.rsplit("/", 1)[-1]


@dataclass(frozen=True)
class Layout:
    """One on-disk form of a dataset: its files per split and how to read them."""

    format: str  # "idx", "cifar-bin" or "cifar-py"
    subfolder: str  # where the files lie inside the dataset folder ("" = directly)
    splits: dict  # split -> file names
    archive: Archive | None = None  # the tarball that unpacks to `subfolder`


@dataclass(frozen=True)
class DatasetInfo:
    """Everything known about one dataset: its files, classes and pixel statistics."""

    name: str
    folder: str  # the dataset's folder under a data root or the cache
    classes: tuple  # class names, index = label
    mean: tuple  # per channel, training set, pixels in [0, 1]
    std: tuple
    image_shape: tuple  # (C, H, W)
    layouts: tuple  # accepted on-disk forms, the one downloads produce first
    sha256: dict = field(default_factory=dict)  # file name -> SHA-256 (files that have one)
    mirrors: tuple = ()  # base URLs that each serve every file of layouts[0]
    records_per_file: int = 0  # CIFAR: records in every batch file

    def model_fields(self):
        """What a model of this dataset must take and give, as ViTConfig fields:
        in_channels, image_size and num_classes."""
        channels, size, _ = self.image_shape
        return {"in_channels": channels, "image_size": size, "num_classes": len(self.classes)}


def _idx_layout():
    return Layout(
        format="idx",
        subfolder="",
        splits={
            "train": ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"),
            "test": ("t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz"),
        },
    )


def _cifar_layout(format, subfolder, suffix, archive):
    return Layout(
        format=format,
        subfolder=subfolder,
        splits={
            "train": tuple(f"data_batch_{i}{suffix}" for i in range(1, 6)),
            "test": (f"test_batch{suffix}",),
        },
        archive=archive,
    )


DATASETS = {
    "mnist": DatasetInfo(
        name="mnist",
        folder="mnist",
        classes=tuple(str(digit) for digit in range(10)),
        mean=(0.1307,),
        std=(0.3081,),
        image_shape=(1, 28, 28),
        layouts=(_idx_layout(),),
        sha256={
            "train-images-idx3-ubyte.gz":
                "440fcabf73cc546fa21475e81ea370265605f56be210a4024d2ca8f203523609",
            "train-labels-idx1-ubyte.gz":
                "3552534a0a558bbed6aed32b30c495cca23d567ec52cac8be1a0730e8010255c",
            "t10k-images-idx3-ubyte.gz":
                "8d422c7b0a1c1c79245a5bcf07fe86e33eeafee792b84584aec276f5a2dbc4e6",
            "t10k-labels-idx1-ubyte.gz":
                "f7ae60f92e00ec6debd23a6088c31dbd2371eca3ffa0defaefb259924204aec6",
        },
        mirrors=(
            "https://ossci-datasets.s3.amazonaws.com/mnist/",
            "https://storage.googleapis.com/cvdf-datasets/mnist/",
        ),
    ),
    "fashion-mnist": DatasetInfo(
        name="fashion-mnist",
        folder="fashion-mnist",
        classes=(
            "T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
            "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot",
        ),
        mean=(0.2860,),
        std=(0.3530,),
        image_shape=(1, 28, 28),
        layouts=(_idx_layout(),),
        sha256={
            "train-images-idx3-ubyte.gz":
                "3aede38d61863908ad78613f6a32ed271626dd12800ba2636569512369268a84",
            "train-labels-idx1-ubyte.gz":
                "a04f17134ac03560a47e3764e11b92fc97de4d1bfaf8ba1a3aa29af54cc90845",
            "t10k-images-idx3-ubyte.gz":
                "346e55b948d973a97e58d2351dde16a484bd415d4595297633bb08f03db6a073",
            "t10k-labels-idx1-ubyte.gz":
                "67da17c76eaffca5446c3361aaab5c3cd6d1c2608764d35dfb1850b086bf8dd5",
        },
        mirrors=("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",),
    ),
    "cifar10": DatasetInfo(
        name="cifar10",
        folder="cifar-10",
        classes=(
            "airplane", "automobile", "bird", "cat", "deer",
            "dog", "frog", "horse", "ship", "truck",
        ),
        mean=(0.4914, 0.4822, 0.4465),
        std=(0.2470, 0.2435, 0.2616),
        image_shape=(3, 32, 32),
        layouts=(
            _cifar_layout("cifar-bin", "cifar-10-batches-bin", ".bin", Archive(
                "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz",
                "c32a1d4ab5d03f1284b67883e8d87530",
            )),
            _cifar_layout("cifar-py", "cifar-10-batches-py", "", Archive(
                "https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz",
                "c58f30108f718f92721af3b95e74349a",
            )),
        ),
        sha256={  # binary version only: the python version has no published per-file sums
            "data_batch_1.bin": "cee916563c9f80d84e3cc88e17fdc0941787f1244f00a67874d45b261883ada5",
            "data_batch_2.bin": "a591ca11fa1708a91ee40f54b3da4784ccd871ecf2137de63f51ada8b3fa57ed",
            "data_batch_3.bin": "bbe8596564c0f86427f876058170b84dac6670ddf06d79402899d93ceea26f67",
            "data_batch_4.bin": "014e562d6e23c72197cc727519169a60359f5eccd8945ad5a09d710285ff4e48",
            "data_batch_5.bin": "755304fc0b379caeae8c14f0dac912fbc7d6cd469eb67a1029a08a39453a9add",
            "test_batch.bin": "8e2eb146ae340b09e24670f29cabc6326dba54da8789dab6768acf480273f65b",
            "batches.meta.txt": "2ce042b1e0b48db4bb214408e6414ba18b2731c24af244f2d6c112fddf31af00",
        },
        records_per_file=10000,
    ),
}


def dataset_info(name):
    """The registry entry of ``name``: ``.classes``, ``.mean``, ``.std``, ``.image_shape``, ..."""
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; valid names: {', '.join(DATASETS)}")
    return DATASETS[name]
